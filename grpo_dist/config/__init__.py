"""The configuration: pydantic sections validated before anything starts (schema.py, run.py) and
the YAML recipes and overrides they are composed from (recipes.py)."""
