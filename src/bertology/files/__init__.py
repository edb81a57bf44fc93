"""Files the commands write and the server reads: output locations checked before the work and written
whole (:mod:`~bertology.files.outputs`, through the one switch of :mod:`~bertology.files.swap`), the run
folders' shared file names and run kinds (:mod:`~bertology.files.run_files`), and files opened below a
folder descriptor without following links (:mod:`~bertology.files.beneath`), and the cache folder
(:mod:`~bertology.files.cache_folder`).

Leaf helpers: any layer may import them; they import only ``bertology.errors``.
"""
