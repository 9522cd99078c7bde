"""Files powerctl reads and writes: `readfile`, `mapping`, `jsonfile`, `outputs`, `cache` (XDG folders)."""
