"""The subject ids that a listing and a bill share: an Azure VM's and a scale set instance's
(`azure:<subscription>/<group>/<name>`, from their ARM resource ids), a GCE VM's (`gce:<project>/<zone>/<name>`, from
Google's full resource names). A leaf, no imports of gpufinops: places.registry reads the Azure prefix and shape at
import, which `rules check` pays for at every start, without model's records (BENCHMARKS.md). model hands every name
on under the same name; callers import them from model.
"""

from __future__ import annotations

import re
from typing import Mapping

# An Azure VM's subject id: `azure:<subscription>/<resource group>/<name>`, in lower case: ARM compares resource ids
# without case and Cost Management's exports write them in lower case, so the listing (places.azure) and the bill
# (collect.billing) name one VM alike.
AZURE_ID_PREFIX = "azure:"
_ARM_VM_ID = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                        r"virtualMachines/([^/]+)$", re.IGNORECASE)


def azure_vm_id(resource_id: str) -> str:
    """The subject id of an Azure VM's ARM resource id; "" for any other id."""
    m = _ARM_VM_ID.match(str(resource_id or "").strip())
    return f"{AZURE_ID_PREFIX}{m.group(1)}/{m.group(2)}/{m.group(3)}".lower() if m else ""


# A Uniform scale set's instance (never listed as a VM): `azure:<subscription>/<group>/<scale set>/<instance id>`,
# from its ARM id `.../virtualMachineScaleSets/<scale set>/virtualMachines/<instance id>` (what Cost Management's
# exports write as its ResourceId): listing and bill name it alike, as a VM.
_ARM_SCALE_SET_VM_ID = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/"
                                  r"virtualMachineScaleSets/([^/]+)/virtualMachines/([^/]+)$", re.IGNORECASE)


def azure_scale_set_vm_id(resource_id: str) -> str:
    """The subject id of a scale set instance's ARM resource id; "" for any other id."""
    m = _ARM_SCALE_SET_VM_ID.match(str(resource_id or "").strip())
    return f"{AZURE_ID_PREFIX}{'/'.join(m.groups())}".lower() if m else ""


def is_azure_scale_set_vm_id(subject_id: str) -> bool:
    """Whether a subject id names an instance of an Azure VM scale set (four parts after `azure:`)."""
    return subject_id.startswith(AZURE_ID_PREFIX) and subject_id.count("/") == 3


def is_azure_vm_id(subject_id: str) -> bool:
    """Whether a text is an Azure VM's subject id exactly as azure_vm_id writes it (a chat click's value is
    untrusted: three parts, lower case, at most ARM's lengths)."""
    parts = subject_id[len(AZURE_ID_PREFIX):].split("/") if subject_id.startswith(AZURE_ID_PREFIX) else []
    return len(parts) == 3 and len(subject_id) <= 200 and azure_vm_id(
        f"/subscriptions/{parts[0]}/resourceGroups/{parts[1]}/providers/Microsoft.Compute/virtualMachines/{parts[2]}"
    ) == subject_id

# A GCE VM's subject id: `gce:<project>/<zone>/<name>` (places.gcp lists VMs by name). Google's bill names a VM by its
# full resource name with the VM's numeric id, `//compute.googleapis.com/projects/<project>/zones/<zone>/instances/<id>`
# (the FOCUS ResourceId, the detailed export's resource.global_name), and by its name in a second column (ResourceName,
# resource.name). A VM the bill names only by its numeric id, that no listing has seen (deleted before gpufinops
# listed it, or in a project gpufinops does not list), is `gce-unlisted:<project>/<zone>/<id>`: still costed per
# project and zone, and saying that it is not a VM gpufinops knows by name.
GCE_ID_PREFIX = "gce:"
GCE_UNLISTED_PREFIX = "gce-unlisted:"
_GCE_VM_ID = re.compile(r"^//compute\.googleapis\.com/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$")
# GCE's instance names (RFC 1035: a lowercase letter first, at most 63 characters); a numeric id is never one.
GCE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def gce_vm_id(global_name: str, name: str = "", project: str = "", zone: str = "") -> str:
    """The subject id of a GCE VM a bill names by its full resource name (`global_name`), "" for any other id: with
    the VM's `name` (a valid GCE name) `gce:<project>/<zone>/<name>`, else, the full name carrying only the numeric
    id, `gce-unlisted:<project>/<zone>/<id>` (resolve_gce_ids() turns it into the listed VM's id). `project` and
    `zone`, where the bill has them as columns (the detailed export's project.id, location.zone), win over the
    full name's (which may carry the project's number)."""
    m = _GCE_VM_ID.match(str(global_name or "").strip())
    if not m:
        return ""
    project, zone = project or m.group(1), zone or m.group(2)
    tail = m.group(3)
    vm = name if GCE_NAME.match(name or "") else tail if GCE_NAME.match(tail) else ""
    return f"{GCE_ID_PREFIX}{project}/{zone}/{vm}" if vm else f"{GCE_UNLISTED_PREFIX}{project}/{zone}/{tail}"


def resolve_gce_ids(subject_ids, known: Mapping[str, str]) -> list[str]:
    """Each subject id, a `gce-unlisted:<project>/<zone>/<id>` whose numeric id a listing knows (`known`: numeric
    id -> subject id, from GpuInstance.cloud_id) turned into that VM's `gce:` id; every other id unchanged."""
    out = []
    for sid in subject_ids:
        text = str(sid)
        if text.startswith(GCE_UNLISTED_PREFIX):
            text = known.get(text.rsplit("/", 1)[-1], text)
        out.append(text)
    return out
