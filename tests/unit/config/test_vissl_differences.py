"""The table "Differences from VISSL's built-in SwAV" (docs/configs.md) against the two configs composed as the
launcher composes them: every recipe key whose value differs is named there, with both values."""
import re

from testkit import REPO, compose

OURS, VISSL = "pretrain/swav/swav_8node_resnet", "vissl/pretrain/swav/swav_8node_resnet"
# differing keys that are the plugin's own blocks (documented in their own sections), not recipe values
OWN_BLOCKS = ("HOOKS.COLLAPSE_DETECTOR.", "HOOKS.ONLINE_KNN.", "HOOKS.PROGRESS.", "LOSS.swav_plugin_loss.",
              "LOSS.deepclusterv2_plugin_loss.", "LOSS.selav2_plugin_loss.",
              "OPTIMIZER.param_schedulers.lr_head.")  # lr_head: VISSL copies lr into it


def _flat(d, p=""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _flat(v, f"{p}{k}.")
    else:
        yield p[:-1], d


def _section():
    text = (REPO / "docs" / "configs.md").read_text()
    m = re.search(r"(?ms)^### Differences from VISSL's built-in SwAV\n(.*?)(?=^### )", text)
    assert m, "the differences section is missing"
    return m.group(1)


def _fmt(v):
    return f"{v:g}" if isinstance(v, float) else str(v)


def test_every_differing_value_is_in_the_table():
    a, b = dict(_flat(compose([f"config={OURS}"]))), dict(_flat(compose([f"config={VISSL}"])))
    table = _section()
    lr_a = a["OPTIMIZER.param_schedulers.lr.schedulers"]
    lr_b = b["OPTIMIZER.param_schedulers.lr.schedulers"]
    # what each differing key must show in the table (both sides)
    shown = {
        "LOSS.name": [a["LOSS.name"], b["LOSS.name"]],
        "MODEL.HEAD.PARAMS": [a["MODEL.HEAD.PARAMS"][0][0], b["MODEL.HEAD.PARAMS"][0][0]],
        "DATA.TRAIN.TRANSFORMS": [a["DATA.TRAIN.TRANSFORMS"][0]["name"], b["DATA.TRAIN.TRANSFORMS"][0]["name"]],
        "OPTIMIZER.num_epochs": [f"| {a['OPTIMIZER.num_epochs']} (", f"| {b['OPTIMIZER.num_epochs']} ("],
        "OPTIMIZER.param_schedulers.lr.lengths": [" / ".join(_fmt(x) for x in a["OPTIMIZER.param_schedulers.lr.lengths"]),
                                                  " / ".join(_fmt(x) for x in b["OPTIMIZER.param_schedulers.lr.lengths"])],
        "OPTIMIZER.param_schedulers.lr.schedulers": [
            " → ".join(_fmt(x) for x in (lr_a[0]["start_value"], lr_a[0]["end_value"], lr_a[1]["end_value"])),
            " → ".join(_fmt(x) for x in (lr_b[0]["start_value"], lr_b[0]["end_value"], lr_b[1]["end_value"]))],
        "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale": ["`auto_scale: False`", "`auto_scale: true`"],
        "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_value": [
            f"`base_value` {_fmt(b['OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_value'])}"],
        "MODEL.AMP_PARAMS.AMP_TYPE": ["native AMP", "apex AMP"],
        "MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE": ["PyTorch SyncBN", "apex SyncBN"],
        "MODEL.SYNC_BN_CONFIG.GROUP_SIZE": [f"`GROUP_SIZE` {b['MODEL.SYNC_BN_CONFIG.GROUP_SIZE']}"],
        "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP": ["`TEMP_FROZEN_PARAMS_ITER_MAP`",
                                              str(b["MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"][0][1])],
        "DISTRIBUTED.RUN_ID": [f"`DISTRIBUTED.RUN_ID: {a['DISTRIBUTED.RUN_ID']}`"],
        "DISTRIBUTED.NCCL_DEBUG": [f"`DISTRIBUTED.NCCL_DEBUG: {a['DISTRIBUTED.NCCL_DEBUG']}`",
                                   f"`NCCL_DEBUG: {b['DISTRIBUTED.NCCL_DEBUG']}`"],
        "DATA.TRAIN.COPY_DESTINATION_DIR": ["`DATA.TRAIN.COPY_DESTINATION_DIR` empty",
                                            f"`{b['DATA.TRAIN.COPY_DESTINATION_DIR']}`"],
        "LOSS.swav_loss.num_crops": [],  # VISSL infers it for whichever config; ours leaves the block unused
    }
    differing = sorted(k for k in set(a) | set(b)
                       if a.get(k, "<absent>") != b.get(k, "<absent>") and not k.startswith(OWN_BLOCKS))
    assert differing, "the two configs compose the same: is config=vissl/... reaching VISSL's file?"
    unnamed = [k for k in differing if k not in shown]
    assert not unnamed, f"values that differ from VISSL's config but are not in the table: {unnamed}"
    missing = [(k, s) for k in differing for s in shown[k] if str(s) not in table]
    assert not missing, missing
