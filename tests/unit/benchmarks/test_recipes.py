"""``benchmarks/recipes.py``: the benchmarks read a shipped recipe from its YAML
(batch, crops, trunk, head, loss equal the file's), build the demo's model from it, and VISSL's own
chain for a ``multicrop_plugin`` transform carries the same parameters."""
import pytest
import torch
import yaml

from testkit import REPO, load_script
br = load_script("benchmarks/recipes.py")


def _yaml(name):
    return yaml.safe_load((REPO / "configs" / "config" / f"{name}.yaml").read_text())["config"]


@pytest.fixture(scope="module")
def demo():
    return br.recipe(br.DEMO_CONFIG)


def test_the_demo_recipe_is_the_yaml(demo):
    y = _yaml(br.DEMO_CONFIG)
    assert demo.batch == y["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"]
    assert demo.transform == y["DATA"]["TRAIN"]["TRANSFORMS"][0]
    assert demo.crops == list(zip(y["DATA"]["TRAIN"]["TRANSFORMS"][0]["num_crops"],
                                  y["DATA"]["TRAIN"]["TRANSFORMS"][0]["size_crops"]))
    assert demo.crops_text == "2x28,4x16"
    assert demo.trunk == y["MODEL"]["TRUNK"]["RESNET_SMALL_PLUGIN"]
    assert [demo.head_name, demo.head] == y["MODEL"]["HEAD"]["PARAMS"][0]
    for key, value in y["LOSS"]["swav_plugin_loss"].items():
        if key != "queue":
            assert demo.loss[key] == value, key


def test_the_model_follows_the_recipe_and_its_overrides(demo):
    trunk, head = br.build_trunk_head(demo)
    assert trunk(torch.zeros(2, 3, 28, 28))[0].shape[1] == 8 * demo.trunk["WIDTH"]
    assert head.prototypes0.weight.shape[0] == demo.head["num_clusters"][0]
    trunk, head = br.build_trunk_head(demo, width=4, num_clusters=[7])
    z, scores = head(trunk(torch.zeros(2, 3, 28, 28))[0])
    assert (z.shape[1], scores.shape[1]) == (demo.head["dims"][-1], 7)
    a, b = br.build_trunk_head(demo), br.build_trunk_head(demo)  # seeded alike
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    loss = br.build_loss(demo, freeze_prototypes_niters=0)
    assert loss.num_prototypes == demo.loss["num_prototypes"]


def test_vissl_chain_carries_the_plugin_transform_parameters():
    t = br.recipe(br.PAPER_CONFIG).transform
    chain = {c["name"]: c for c in br.vissl_chain(t)}
    assert chain["ImgPilToMultiCrop"]["num_crops"] == t["num_crops"] == [2, 6]
    assert chain["ImgPilToMultiCrop"]["size_crops"] == t["size_crops"]
    assert chain["RandomHorizontalFlip"]["p"] == t["flip_p"]
    assert chain["ImgPilColorDistortion"]["strength"] == t["color_strength"]
    assert [chain["ImgPilGaussianBlur"][k] for k in ("p", "radius_min", "radius_max")] == [t["blur_p"], *t["blur_sigma"]]
    assert chain["Normalize"]["mean"] == t["mean"]
    with pytest.raises(ValueError, match="grayscale_p"):
        br.vissl_chain(dict(t, grayscale_p=0.5))
    small = br.with_crops(t, [(2, 32), (4, 16)])
    assert (small["num_crops"], small["size_crops"], small["total_num_crops"]) == ([2, 4], [32, 16], 6)
    assert small["crop_scales"] == t["crop_scales"] and br.with_crops(t, None) == t
