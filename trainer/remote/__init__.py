"""Other machines: the hosts file, ssh (one master connection per host), the protocol (declared once: frames,
names, limits; where a host's word is checked), the agent (the host's side), the mirror (this side's), SLURM, and the
remote command lines.

May import every package below it; the CLI (trainer/cli.py) and Auto sit above.
"""
