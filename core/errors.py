"""Errors meant for the person at the keyboard.

A `UserError` carries a one-line message that names what is wrong and how to fix it. The CLI
prints it as ``error: <message>`` and exits with status 2 instead of showing a traceback.
"""


class UserError(Exception):
    """A mistake in the user's input (config, path, data) with a one-line, actionable message."""
