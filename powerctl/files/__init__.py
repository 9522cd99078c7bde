"""The files powerctl reads and writes: `readfile`, `mapping`, `jsonfile`, `outputs`, `cache`, `xdg`."""
