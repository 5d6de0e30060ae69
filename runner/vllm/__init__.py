"""vLLM as a second engine: the speculative config a cell maps to, where it runs (here, in vLLM's own environment,
or on a server a team already runs), and each request's verify steps as rounds."""
