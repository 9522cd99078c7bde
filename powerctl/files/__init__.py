"""The files powerctl reads and writes: one bounded reader of named files (`readfile`), one reader of
mappings (`mapping`), versioned JSON (`jsonfile`), output paths checked before the work and written
atomically (`outputs`), the cache folder (`cache`) and the XDG base folders (`xdg`)."""
