"""Calibration at serving time: the profile file and the maps it names.

Pure logic, no I/O beyond reading and writing profile files.

    profile.py    the profile file, apply(), route(), check_compatible()
    transform.py  the calibration maps (temperature, Platt, isotonic), top_index

Fitting a profile (reading labelled items through a running proxy, the fit, the
report) is an offline tool: ``semif_tools/calibrate`` (``python -m semif_tools calibrate``),
which imports these two modules; nothing here imports it.
"""
