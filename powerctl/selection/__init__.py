"""Choosing (batch size, GPU frequency) under a power cap, and staying under it.

`joint` is Algorithm 1, `methods` the registry of methods (`names` their spellings), `baselines` and
`caps` the state of practice and the other references, `pareto` the time-energy front, `capsource`
caps that change over time, `follow` re-selection when they do and `guard` the step-down when measured
power exceeds the cap. They read profiles and relation vectors and return picks (`powerctl.records`).
"""
