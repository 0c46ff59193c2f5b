// Reads a JSON list of Kubernetes objects on stdin; validates each custom resource
// against its CRD's published schema (kubernetes-models); prints a JSON list of
// {kind, name, errors} (errors null when valid, "unknown" when no schema is installed).
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const models = {
  "keda.sh/v1alpha1": keda,
  "monitoring.coreos.com/v1": monitoring,
};

let input = "";
for await (const chunk of process.stdin) input += chunk;
const report = JSON.parse(input).map((doc) => {
  const Model = (models[doc.apiVersion] || {})[doc.kind];
  const entry = { kind: doc.kind, name: doc.metadata?.name ?? null, errors: null };
  if (!Model) {
    entry.errors = "unknown";
    return entry;
  }
  try {
    new Model(doc).validate();
  } catch (err) {
    entry.errors = err.message;
  }
  return entry;
});
process.stdout.write(JSON.stringify(report));
