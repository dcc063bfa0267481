"""The web console: read-mostly HTML pages over the api, served by Rota itself.

A client of the api like the CLI: every page is built from SDK calls (`rota.client`) made
with the caller's own token, so the api decides what each tenant sees. See `main.py`.
"""
