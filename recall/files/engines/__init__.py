"""The engines that search a files store's sources, behind one seam (base.py): funes as a subprocess
(funes.py) or the embedded engine (embedded/); factory.py picks one from the settings."""
