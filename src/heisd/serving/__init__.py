"""`heisd serve`: a policy server (FastAPI + uvicorn) with episodes as sessions, one model worker
and a bounded queue. `heisd.client` is the robot side (`heisd.profiling.loadtest` loads a server with it)."""
