"""The files powerctl reads and writes: named files (`readfile`), mappings (`mapping`), versioned JSON
(`jsonfile`), outputs (`outputs`), the cache (`cache`) and the XDG base folders (`xdg`)."""
