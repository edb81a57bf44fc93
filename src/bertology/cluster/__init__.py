"""Corpus work on a Ray cluster, with the results of one machine.

May import the corpus runs, probes and interventions it distributes and what lies below them; the
renderers and front ends import it.

A run is cut into *shards* (:mod:`bertology.cluster.shards`): consecutive batches of the very batch
order a local run uses, each with the number of its first segment. Ray actors
(:mod:`bertology.cluster.workers`) each start the run's job once (load the model) and fold their shards
into fresh streaming accumulators numbered from the shard's first segment; the driver merges what they
return in shard order, keeps a checkpoint and reports progress (:mod:`bertology.cluster.driver`).
Everything random is keyed by the segment's number, so where a shard runs never changes the result.
:mod:`bertology.cluster.analyze`, :mod:`bertology.cluster.compare`, :mod:`bertology.cluster.probes` and
:mod:`bertology.cluster.ablation` are ``bertology analyze``, ``bertology compare``, ``bertology probe
deps`` / ``probe coref`` and ``bertology ablate`` on Ray. Ray is optional
(``pip install bertology[ray]``) and imported only when a session or a pool starts.
"""
