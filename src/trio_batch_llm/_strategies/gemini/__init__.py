"""Gemini's ``generateContent``: the strategy over ``google-genai``, its dialect, errors, caching, batches."""
