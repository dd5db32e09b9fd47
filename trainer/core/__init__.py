"""The ground floor, torch-free: errors, files and OS facts (system), CSV cells, the export catalog, the config
(every key declared once), the event stream, the run directory (state, liveness, the last line), parameter-group
matching, the learning-rate schedule rule and the fine-tuning recipes.

The only trainer code the desktop app imports directly, with what `data`, `deploy`, `runs` and `remote` keep
torch-free (tests/test_layering.py derives that set from the imports). Imports nothing else of trainer.
"""
