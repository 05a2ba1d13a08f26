"""Reading stores: run summaries, the filter language, and the read API."""
