"""Kernel jobs' side effects: workflow.yaml loading, static checks of candidates, verification.

Pure helpers live in `config_loader` and `static_checks`; nothing here imports torch or triton
at module level.
"""
