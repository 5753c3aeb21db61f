"""Pydantic models shared by the client, workflows and activities. Imports nothing else of ours."""
