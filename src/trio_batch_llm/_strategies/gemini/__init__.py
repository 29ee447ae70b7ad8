"""Gemini's ``generateContent``: the strategy over the official ``google-genai`` SDK, its wire dialect and errors, context caching and batch mode."""
