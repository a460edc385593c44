"""The bottom layer: exit statuses and errors, the results record (one schema, written by the chief, read by the
report) and how Horovod was built. Imports nothing of the project above it (scripts/check_structure.py)."""
