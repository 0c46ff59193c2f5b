"""The ``calibrate`` command: fit a calibration profile on labelled data read through a
running proxy, and write the profile and its report.

What the proxy serves from a profile (the file format, the maps) is
``proxy/calibration/profile.py`` and ``transform.py``; everything here only makes one.

    cli.py           python -m semif_tools calibrate: the flags, reading, the two ways in
    dataset.py       the labelled JSONL format
    read.py          reading items through a running proxy (the only module that speaks HTTP)
    scores.py        accuracy, ECE, Brier, NLL, reliability bins, coverage curve
    stats.py         Clopper-Pearson bounds, bootstrap intervals, fixed-sequence thresholds
    fit.py           the held-out split, the maps by cross-validation, floor and threshold
    profile_fit.py   the profile a fit makes, and its summary (both ways of fitting)
    rerank_fit.py    rerank data: NDCG@k, MRR, the query split, the scores' map
    from_records.py  calibrate --records: the items made from decision records and outcomes
    report.py        the Markdown report and its two PNGs (matplotlib, Agg)
"""
