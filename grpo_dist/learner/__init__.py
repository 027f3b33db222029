"""The learner actor: policy, reference model, optimizer, weight export."""
