"""Integrations with training frameworks. Each module imports its framework, so import the one
you use (nothing here is imported by ``import async_tracker``):

- :mod:`async_tracker.integrations.lightning`: ``AsyncTrackerLogger``, a Lightning ``Logger``
  (extra ``lightning``).
- :mod:`async_tracker.integrations.transformers`: ``AsyncTrackerCallback``, a Hugging Face
  ``TrainerCallback`` (extra ``transformers``).
"""
