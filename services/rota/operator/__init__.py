"""The server side of the `rota` command: the commands that run Rota's own processes.

`rota up`, `down` and `demo` (a whole cluster on one machine: `localcluster`), `rota serve`
(one control-plane service), `rota agent` (a node agent) and `rota db migrate`. The CLI
(`rota.cli.registry`, in the client distribution) names their handlers by module string, so
a client-only install still lists them and answers that they need the server distribution.
"""
