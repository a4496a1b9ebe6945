"""The `speedrun` command: main.py lists the subcommands; the commands that belong to no other
folder (data, cache, presets) live here.
"""
