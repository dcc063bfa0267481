"""The files a node's agent and a job's processes exchange (`ROTA_CONTROL_DIR`).

Two halves of one protocol meet here: the agent (`rota.agent.checkpoints`) writes checkpoint
and pause requests and decisions, the job runtime (`rota.runtime.state`) registers its ranks,
acknowledges and votes. Both import this package and nothing of each other; it imports only
the image format's atomic writes and markers (`rota.imageformat.files`).
"""
