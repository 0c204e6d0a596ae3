"""The pipeline layer under every driver: the one content-keyed stage cache
(:mod:`structlens.pipeline.cache`) and progress bars over the executor
(:mod:`structlens.pipeline.progress`).  ``analyze`` and the replications run the methods'
stages through it; the methods never import it."""
