"""The BUILD rules: attribute schemas (pydantic) and the functions BUILD files call."""
