"""`tinyattn serve`: an OpenAI-compatible completions endpoint and a playground page.

schemas.py (the request models, the limits, OpenAI-style errors), worker.py (the one thread
that runs the model), app.py (the routes), server.py (uvicorn, a server in a thread),
playground.html/.css/.js (the page at `/`, package data). Needs the `serve` extra
(`pip install 'tinyattn[serve]'`); `server.require_serve_extra` says so in one line.
"""
