"""vLLM as a second engine: the speculative config a cell maps to, the server it runs in (started here in vLLM's own
environment, or one a team already runs), and each request's verify steps as rounds."""
