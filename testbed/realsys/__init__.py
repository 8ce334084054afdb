"""Real external systems started for tests and game days (PostgreSQL ...).

Each module starts one system the way its operators run it (the distribution's
own binaries, a scratch folder, a private loopback port) and tears it down
again, so a sink adapter is proved against the real thing rather than a
stand-in.
"""
