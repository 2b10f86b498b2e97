"""Process tuning that must happen before the libraries it concerns are imported or
threads start: modules `steward run` never uses kept unloaded (`lean_imports`), one
malloc arena (`malloc`), and whether log lines are drawn or JSON (`log_format`).

Standard library only, and nothing is imported here.
"""
