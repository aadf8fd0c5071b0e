"""What a run's provenance records of its server's environment."""

from serving_study.servers.environment import recorded_environment


def test_provenance_keeps_the_settings_that_shape_a_server_and_no_secret():
    environment = {
        "OMP_NUM_THREADS": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/cache",
        "HF_HUB_OFFLINE": "1",
        "SERVING_STUDY_PAUSE_GC_AT_START": "1",
        "HF_TOKEN": "hf_secret",
        "MY_SERVICE_PASSWORD": "x",
        "PATH": "/usr/bin",
        "HOME": "/root",
    }
    assert recorded_environment(environment, secret_names=("MY_SERVICE_PASSWORD",)) == {
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "SERVING_STUDY_PAUSE_GC_AT_START": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/cache",
    }
