"""Demonstrations: generation with scripted experts and the LIBERO/robomimic HDF5 reader."""
