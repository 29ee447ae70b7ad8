"""OpenAI's wire format, the SDK and compatible strategies, and the Batch API."""
