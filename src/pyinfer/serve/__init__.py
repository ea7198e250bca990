"""Ways to deploy the OpenAI-compatible server of `pyinfer.server` beyond one process:
`pyinfer.serve.ray`, the engine as a Ray Serve application (the `[ray]` extra)."""
