"""The API process's side of the engine process, which it starts by module path
(``infer.engine.process``) and reaches over the pipes of ``contract``; API workers, and
running a whole server."""
