// Package deploy holds no code: its tests check the deployment files around
// it against the program they deploy. They parse the Dockerfile,
// .dockerignore, docker-compose.yml and the Kubernetes manifests under
// deploy/k8s, and check every RATCHET_* name against the configuration
// reference, the probe paths and ports against the HTTP server, the replica
// counts against the partition counts, and the grace periods against
// shutdown.timeout. A second test builds the fully static binary the image
// runs (`make image-binary`) and runs it against kfake and PostgreSQL.
// README.md beside them documents the image, compose, scaling and
// Kubernetes; its RATCHET_* names are checked too.
package deploy
