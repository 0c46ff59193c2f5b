"""Wire formats: pydantic models and the translation of their errors."""
