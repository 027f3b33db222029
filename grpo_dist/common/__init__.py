"""Small helpers every part shares: the data types that flow between actors, seeds, atomic
files, waits, model files, process exits."""
