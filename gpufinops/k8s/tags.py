"""The names rules select Kubernetes subjects by: the Kueue label of a queued Job, the tags gpufinops gives a
Kueue-managed Job and a GPU node, and how a node's subject id begins. A leaf, no imports: places.registry (which
rules.py reads at every start, to check what a rule selects) needs these names, not k8s.model's types (their
import is a few ms of `rules check`, BENCHMARKS.md). k8s.model hands them on under the same names.
"""

# Kueue (docs/kubernetes.md, "Kueue: suspend, don't kill"): the label of a Job Kueue queues, and the tag of a
# Kueue-managed Job gpufinops may suspend: its Workload (namespace/name).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAG_KUEUE_WORKLOAD = "k8s:kueue-workload"
# A GPU node as the act stage sees it: instance id `k8s:node/<name>`, tagged so that rules select nodes by it
# (`tags: {"k8s:node": "*"}`; a label key cannot hold ':', so no node label collides).
NODE_ID_PREFIX = "k8s:node/"
TAG_NODE = "k8s:node"
