"""The LLM layer: provider converters, the chat activity, structured-answer parsing."""
