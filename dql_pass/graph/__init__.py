"""Graph helpers, one home each: :mod:`~dql_pass.graph.walk` (scopes, sites, live values, the ops a
model uses, a node's label), :mod:`~dql_pass.graph.names` (unique names, shared constants),
:mod:`~dql_pass.graph.constants` (reading constants, dropping unused ones) and
:mod:`~dql_pass.graph.slice` (a backward slice into a site model)."""
