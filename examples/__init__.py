"""The bundled applications, written with the public API exactly as a user's app is.

They are registered like any other app (the default of `EVENTIDE_APPS`):
`examples.logs:app`, `examples.market:app`, `examples.words:app`. Nothing in the framework
(`transforms`, `windows`, `assets`, `orchestration`) imports them.
"""
