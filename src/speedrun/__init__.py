"""speedrun: the NanoGPT speedrun as installable, tested software.

Nothing runs at import: importing the package only defines names.
"""

__version__ = "0.1.0"
