"""The built-in methods' names, the one spelling of each: the registry (`methods`) finds a method by it
and the baselines stamp it on the pair they choose (`Pick.method`)."""

OURS = "ours"
STATE_OF_PRACTICE = "state-of-practice"
PROXY_BATCH = "proxy-batch"
ORACLE = "oracle"
OURS_DEADLINE = "ours-deadline"
