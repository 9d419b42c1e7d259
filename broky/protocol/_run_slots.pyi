#: Whether the compiled reader stores a Run's fields straight at its slots'
#: offsets (the layout checked at import) rather than by name.
DIRECT_SLOTS: bool
