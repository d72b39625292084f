"""tfbuilder's own data formats, one module per kind of layout, each registered as a plugin's would be
(:func:`tfbuilder.data.readers.register_format`); :mod:`tfbuilder.spec.formats` imports them by name."""
