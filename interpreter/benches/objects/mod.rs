//! The objects the interpreter benchmarks evaluate (shared with `examples/health_instructions.rs`).

use serde_json::{Value, json};

fn container(name: &str, cpu: &str, memory: &str, gpus: u32) -> Value {
    let mut limits = json!({"cpu": cpu, "memory": memory});
    if gpus > 0 {
        limits["nvidia.com/gpu"] = json!(gpus);
    }
    json!({
        "name": name,
        "image": "ghcr.io/example/trainer:2.3.1",
        "command": ["torchrun", "--nnodes", "4", "train.py"],
        "env": [
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
        ],
        "resources": {"requests": limits.clone(), "limits": limits},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "data", "mountPath": "/data"}]
    })
}

/// A Deployment as a member cluster reports it (metadata, spec, status; managedFields omitted).
pub fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "inference",
            "namespace": "serving",
            "generation": 7,
            "resourceVersion": "884213",
            "uid": "0b6d4c1e-52a4-4f6c-9a0e-0c8a3f5d2b11",
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app": "inference", "team": "ml"},
            "annotations": {"deployment.kubernetes.io/revision": "7", "resourcetemplate.karmada.io/generation": "7"}
        },
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "inference"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": {"app": "inference"}},
                "spec": {
                    "containers": [container("server", "4", "16Gi", 1)],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "data", "persistentVolumeClaim": {"claimName": "models"}}],
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                }
            }
        },
        "status": {
            "observedGeneration": 7,
            "replicas": 4,
            "updatedReplicas": 4,
            "readyReplicas": 4,
            "availableReplicas": 4,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "lastTransitionTime": "2026-11-01T10:02:00Z", "lastUpdateTime": "2026-11-01T10:02:00Z", "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "lastTransitionTime": "2026-11-01T10:00:00Z", "lastUpdateTime": "2026-11-01T10:02:00Z", "message": "ReplicaSet \"inference-7c9\" has successfully progressed."}
            ]
        }
    })
}

/// A running AppWrapper wrapping a PyTorchJob (1 master + 3 GPU workers), as reported by a member.
pub fn appwrapper() -> Value {
    let pod_template = |gpus| {
        json!({
            "metadata": {"labels": {"app": "train"}},
            "spec": {
                "containers": [container("pytorch", "8", "64Gi", gpus)],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}]
            }
        })
    };
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {
            "name": "llm-finetune",
            "namespace": "team-a",
            "generation": 1,
            "uid": "6f1f2d8e-3c3b-4b8e-8f7a-2d9c1e0b5a77",
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
            "annotations": {"workload.codeflare.dev.appwrapper/retryLimit": "3"}
        },
        "spec": {
            "suspend": false,
            "components": [{
                "podSets": [
                    {"replicas": 1, "path": "template.spec.pytorchReplicaSpecs.Master.template"},
                    {"replicas": 3, "path": "template.spec.pytorchReplicaSpecs.Worker.template"}
                ],
                "template": {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "metadata": {"name": "llm-finetune"},
                    "spec": {"pytorchReplicaSpecs": {
                        "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": pod_template(1)},
                        "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": pod_template(8)}
                    }}
                }
            }]
        },
        "status": {
            "phase": "Running",
            "resettingCount": 0,
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "Resuming", "message": "Suspend is false", "lastTransitionTime": "2026-11-20T08:00:00Z"},
                {"type": "ResourcesDeployed", "status": "True", "reason": "Resuming", "message": "Suspend is false", "lastTransitionTime": "2026-11-20T08:00:00Z"},
                {"type": "PodsReady", "status": "True", "reason": "SufficientPodsReady", "message": "4 pods running; 0 pods succeeded", "lastTransitionTime": "2026-11-20T08:03:00Z"},
                {"type": "Unhealthy", "status": "False", "reason": "FoundNoFailedPods", "message": "", "lastTransitionTime": "2026-11-20T08:00:00Z"}
            ],
            "componentStatus": [{
                "name": "llm-finetune", "kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1",
                "podSets": [
                    {"replicas": 1, "path": "template.spec.pytorchReplicaSpecs.Master.template"},
                    {"replicas": 3, "path": "template.spec.pytorchReplicaSpecs.Worker.template"}
                ],
                "conditions": [{"type": "ResourcesDeployed", "status": "True", "reason": "ComponentCreatedSuccessfully", "lastTransitionTime": "2026-11-20T08:00:01Z"}]
            }]
        }
    })
}
