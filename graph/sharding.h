// Sharding of values over a device mesh.
//
// A Mesh names its axes ("dp", "tp") with sizes; rank r has coordinates with the last axis
// fastest, so a tensor-parallel group is a run of consecutive ranks.
//
// Compound axes (for plans whose ops use different tp x dp splits of one set of ranks): an axis
// may span several base axes (`parts`, major first); its coordinate is the mixed-radix number of
// theirs and its groups are the ranks that differ only in those base axes. Ranks count over the
// base axes alone. Two axes overlap when they share a base axis; a spec never uses overlapping
// axes on two dimensions (or sharded and partial).
//
// A ShardingSpec says, per dimension of a value, whether it is replicated or split over one mesh
// axis (`Shard(axis)`), optionally in `segments` equal segments each split separately (a fused
// QKV weight [C, 3C]: every rank holds its part of q, of k and of v); and over which mesh axes the
// value is a partial sum pending a reduction (`Partial(sum)`). A mesh axis shards at most one
// dimension, and is never both sharding and partial.
//
// Sharding rules (OpSchema::shard, one per op family file) map the specs of a node's inputs to its
// outputs' specs, and may require an input in another spec; an unhandled combination is an error
// naming the op and the specs, never a silent replicate.
//
// This header gathers graph/mesh.h, graph/sharding_spec.h, graph/sharding_rules.h and
// graph/slicing.h.
#pragma once

#include "graph/mesh.h"
#include "graph/sharding_rules.h"
#include "graph/sharding_spec.h"
#include "graph/slicing.h"
