"""The few exceptions osm raises for input a user can fix.

cli/ turns each into one line, "Error: <message>", on stderr and exit code 1.
"""


class OsmError(Exception):
    """Bad input or an impossible request, with a message the user can act on."""


class InputError(OsmError):
    """A file or value that cannot be read as the numbers osm needs."""


class ShapeError(OsmError):
    """Arrays whose shapes do not fit together (heads, lengths, masks)."""
