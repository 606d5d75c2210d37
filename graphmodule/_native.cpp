// graphmodule's compiled hot path (opt-in: GRAPHMODULE_NATIVE=1, see _native.py).
//
// The same steps as CudaGraphModule.__call__'s Python hot path, for the case it serves:
// a wrapper holding one graph, called with tensors only, each argument one tensor
// (positional, or by keyword in the captured order), whose graph has one output and no
// effects. It calls the same primitives the Python path calls
// (dynamo's TensorGuards, the dict watchers' flags, torch's storage use count, copy_,
// the graph's replay), so it accepts a call only where the Python path would replay it.
// Anything else, or any doubt, goes to the Python path unchanged (`fallback`), which
// then re-arms this one (_native.arm) from the state it leaves.

#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/autocast_mode.h>
#include <pythread.h>

#include <vector>

namespace py = pybind11;

namespace {

struct OutputSet {           // the graph or one of its twins (see _lend)
  std::vector<py::object> bufs;  // static input buffers, by input position
  py::object replay, replay_arg;  // replay(replay_arg), or replay() where the arg is None
  int kind = 0;                   // 0 lent (outputs="safe"), 1 static, 2 clone
  py::object out;                 // lent template, or the static output
  py::object cdata;               // the lent storage's cdata (an int), for use_count
  py::object base;                // its use count with nobody else holding it
  c10::StorageImpl* storage = nullptr;  // the same storage, counted here directly where that
  size_t direct_base = 0;               // count was found equal to torch's (see make)
};

struct Hot {
  size_t n = 0;      // tensor leaves: the positional arguments, then the keyword ones
  size_t n_pos = 0;  // positional arguments
  py::object kwnames;  // the keywords' names in the captured order, or None
  unsigned long thread = 0;
  bool grad = false;
  bool inference = false;  // captured under torch.inference_mode()
  py::object acquire, release, stats, depth, active, guard_check;
  py::object mode_flag, mode_reader, mode, modes, interaction_fn, interaction;
  py::object watch_flag, containers, keys, objects, cells, cell_objects, same_addresses, tobjs, tptrs, tindex;
  py::object use_count;
  std::vector<py::object> addressed;  // the watch's tensors, and the addresses the graph reads
  std::vector<void*> addresses;
  bool direct_addresses = false;      // compared here (found to agree with same_addresses)
  std::vector<OutputSet> sets;
  long served = 0;
  long epoch = 0;  // the install it was made under (a state from before disable_native is stale)
};

PyObject* g_python_call = nullptr;  // the Python __call__: every call this path declines
PyObject* g_arm = nullptr;          // _native.arm(wrapper): re-arms after the Python path
PyObject* s_hot = nullptr;          // interned names
PyObject* s_raised = nullptr;
PyObject* s_modes = nullptr;
PyObject* s_replays = nullptr;
PyObject* s_read = nullptr;
PyObject* s_served = nullptr;
PyObject* g_one = nullptr;
long g_epoch = 0;

const char* kCapsule = "graphmodule.native.Hot";

void destroy(PyObject* capsule) {
  delete static_cast<Hot*>(PyCapsule_GetPointer(capsule, kCapsule));
}

// 1: true, 0: false, -1: a Python error (set)
int truth_of(PyObject* result) {
  if (result == nullptr) return -1;
  int t = PyObject_IsTrue(result);
  Py_DECREF(result);
  return t;
}

int flag_raised(PyObject* flag) {  // a _dictwatch.Flag, or None (no dict watchers here)
  if (flag == Py_None) return 0;
  return truth_of(PyObject_GetAttr(flag, s_raised));
}

int equal(PyObject* a, PyObject* b) { return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ); }

// Whether the call's mode is the graph's (ModeReader.read() == entry.mode, as the Python path).
int modes_ok(Hot& h) {
  if (at::GradMode::is_enabled() != h.grad || c10::InferenceMode::is_enabled() != h.inference) return 0;
  // the graphs served here were captured with autocast off (_native._mirror)
  if (at::autocast::is_autocast_enabled(at::kCUDA) || at::autocast::is_autocast_enabled(at::kCPU)) return 0;
  PyObject* now = PyObject_CallNoArgs(h.interaction_fn.ptr());
  if (now == nullptr) return -1;
  int same = equal(now, h.interaction.ptr());
  Py_DECREF(now);
  if (same != 1) return same;
  if (h.mode_flag.is_none()) {  // no dict watchers: the reader reads every module
    PyObject* read = PyObject_CallMethodNoArgs(h.mode_reader.ptr(), s_read);
    if (read == nullptr) return -1;
    same = equal(read, h.mode.ptr());
    Py_DECREF(read);
    return same;
  }
  int raised = flag_raised(h.mode_flag.ptr());
  if (raised != 0) return raised < 0 ? -1 : 0;  // a module's mode may have changed: Python reads
  PyObject* cached = PyObject_GetAttr(h.mode_reader.ptr(), s_modes);
  if (cached == nullptr) return -1;
  same = equal(cached, h.modes.ptr());
  Py_DECREF(cached);
  return same;
}

// The watched tensors' addresses, as torch's same_addresses compares them (tensor.data_ptr()).
int addresses_ok(Hot& h) {
  try {
    for (size_t i = 0; i < h.addressed.size(); ++i) {
      PyObject* obj = h.addressed[i].ptr();
      if (!THPVariable_Check(obj)) return 0;
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (!t.has_storage() || t.data_ptr() != h.addresses[i]) return 0;
    }
  } catch (...) {  // a tensor whose memory cannot be read here: the Python path decides
    return 0;
  }
  return 1;
}

// Watch.check() where it would take its fast branch; 0 wherever it would look further.
int watch_ok(Hot& h) {
  int raised = flag_raised(h.watch_flag.ptr());
  if (raised != 0) return raised < 0 ? -1 : 0;
  PyObject* containers = h.containers.ptr();
  Py_ssize_t places = PyList_GET_SIZE(containers);
  for (Py_ssize_t i = 0; i < places; ++i) {
    PyObject* now = PyObject_GetItem(PyList_GET_ITEM(containers, i), PyList_GET_ITEM(h.keys.ptr(), i));
    if (now == nullptr) {  // removed: the Python path says what changed
      PyErr_Clear();
      return 0;
    }
    Py_DECREF(now);  // (compared by address only)
    if (now != PyList_GET_ITEM(h.objects.ptr(), i)) return 0;
  }
  Py_ssize_t cells = PyList_GET_SIZE(h.cells.ptr());
  for (Py_ssize_t i = 0; i < cells; ++i) {
    if (PyCell_GET(PyList_GET_ITEM(h.cells.ptr(), i)) != PyList_GET_ITEM(h.cell_objects.ptr(), i)) return 0;
  }
  if (h.direct_addresses) return addresses_ok(h);
  PyObject* args[3] = {h.tobjs.ptr(), h.tptrs.ptr(), h.tindex.ptr()};
  return truth_of(PyObject_Vectorcall(h.same_addresses.ptr(), args, 3, nullptr));
}

// 1: this set's lent result is free (or it lends nothing), 0: held, -1: error
int set_free(Hot& h, OutputSet& s) {
  if (s.kind != 0) return 1;
  if (s.storage != nullptr) return c10::raw::intrusive_ptr::use_count(s.storage) == s.direct_base ? 1 : 0;
  PyObject* arg = s.cdata.ptr();
  PyObject* count = PyObject_Vectorcall(h.use_count.ptr(), &arg, 1, nullptr);
  if (count == nullptr) return -1;
  int same = equal(count, s.base.ptr());
  Py_DECREF(count);
  return same;
}

PyObject* python_path(PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject* out = PyObject_Vectorcall(g_python_call, args, nargsf, kwnames);
  if (out == nullptr) return nullptr;
  PyObject* armed = PyObject_Vectorcall(g_arm, args, 1, nullptr);  // args[0]: the wrapper
  if (armed == nullptr) {
    Py_DECREF(out);
    return nullptr;
  }
  Py_DECREF(armed);
  return out;
}

// The replay of set `s` for inputs args[1..n]: the result, or nullptr with an error set.
PyObject* replay(Hot& h, OutputSet& s, PyObject* const* inputs) {
  HANDLE_TH_ERRORS
  // stats.replays += 1, as the Python path counts (before the replay, as it does)
  PyObject* count = PyObject_GetAttr(h.stats.ptr(), s_replays);
  if (count == nullptr) return nullptr;
  PyObject* more = PyNumber_Add(count, g_one);
  Py_DECREF(count);
  if (more == nullptr || PyObject_SetAttr(h.stats.ptr(), s_replays, more) < 0) {
    Py_XDECREF(more);
    return nullptr;
  }
  Py_DECREF(more);
  if (h.n == 1) {
    PyObject* buf = s.bufs[0].ptr();
    if (inputs[0] != buf) THPVariable_Unpack(buf).copy_(THPVariable_Unpack(inputs[0]));  // (a producer wrote into it)
  } else {  // as StaticInputs.copy_from: one foreach copy of the buffers no producer wrote into
    std::vector<at::Tensor> dests, srcs;
    dests.reserve(h.n);
    srcs.reserve(h.n);
    for (size_t i = 0; i < h.n; ++i) {
      PyObject* buf = s.bufs[i].ptr();
      if (inputs[i] == buf) continue;
      dests.push_back(THPVariable_Unpack(buf));
      srcs.push_back(THPVariable_Unpack(inputs[i]));
    }
    if (dests.size() == 1) {
      dests[0].copy_(srcs[0]);
    } else if (!dests.empty()) {
      at::_foreach_copy_(dests, srcs);
    }
  }
  PyObject* done = s.replay_arg.is_none() ? PyObject_CallNoArgs(s.replay.ptr())
                                          : PyObject_CallOneArg(s.replay.ptr(), s.replay_arg.ptr());
  if (done == nullptr) return nullptr;
  Py_DECREF(done);
  ++h.served;
  if (s.kind == 1) return Py_NewRef(s.out.ptr());
  const at::Tensor& out = THPVariable_Unpack(s.out.ptr());
  return THPVariable_Wrap(s.kind == 0 ? out.detach() : out.clone());
  END_HANDLE_TH_ERRORS
}

// Every check the Python hot path makes for this call, in its order; -1 error, 0 decline.
int accept(Hot& h, PyObject* const* inputs) {
  if (PyThread_get_thread_ident() != h.thread) return 0;
  for (size_t i = 0; i < h.n; ++i)
    if (!THPVariable_Check(inputs[i])) return 0;
  int ok = truth_of(PyObject_Vectorcall(h.guard_check.ptr(), inputs, h.n, nullptr));
  if (ok != 1) {
    if (ok < 0) PyErr_Clear();  // (the Python path catches the same TypeError)
    return 0;
  }
  if ((ok = modes_ok(h)) != 1) return ok;
  if ((ok = watch_ok(h)) != 1) {
    if (ok < 0) PyErr_Clear();  // Watch.check() answers False on these; the Python path will
    return 0;
  }
  // not inside another wrapper's capture, not while another thread captures
  if (PyObject_IsTrue(PyList_GET_ITEM(h.depth.ptr(), 0)) || PyObject_IsTrue(PyList_GET_ITEM(h.active.ptr(), 0)))
    return 0;
  return 1;
}

// Called as captured: as many positional arguments, the same keywords in the same order.
bool same_shape(Hot& h, Py_ssize_t positional, PyObject* kwnames) {
  if ((size_t)positional != h.n_pos) return false;
  Py_ssize_t given = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  if (h.kwnames.is_none()) return given == 0;
  PyObject* names = h.kwnames.ptr();
  if (given != PyTuple_GET_SIZE(names)) return false;
  for (Py_ssize_t i = 0; i < given; ++i) {
    PyObject *a = PyTuple_GET_ITEM(kwnames, i), *b = PyTuple_GET_ITEM(names, i);
    if (a != b && PyUnicode_Compare(a, b) != 0) return false;
  }
  return true;
}

PyObject* hot_call(PyObject*, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "CudaGraphModule.__call__ needs the wrapper");
    return nullptr;
  }
  PyObject* self = args[0];
  PyObject* capsule = PyObject_GetAttr(self, s_hot);
  if (capsule == nullptr) {  // (a subclass that never set it up)
    PyErr_Clear();
    return PyObject_Vectorcall(g_python_call, args, nargsf, kwnames);
  }
  if (capsule == Py_None || capsule == Py_False) {  // not armed (None: try after this call)
    bool arm = capsule == Py_None;
    Py_DECREF(capsule);
    return arm ? python_path(args, nargsf, kwnames) : PyObject_Vectorcall(g_python_call, args, nargsf, kwnames);
  }
  Hot* h = static_cast<Hot*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (h == nullptr) {
    Py_DECREF(capsule);
    return nullptr;
  }
  PyObject* result = nullptr;
  int ok = 0;
  if (h->epoch == g_epoch && same_shape(*h, nargs - 1, kwnames)) {
    PyObject* locked = PyObject_CallNoArgs(h->acquire.ptr());
    if (locked == nullptr) {
      Py_DECREF(capsule);
      return nullptr;
    }
    Py_DECREF(locked);
    // Under the lock, still the wrapper's state? (Read before the lock: another thread's
    // Python path may have taken the wrapper over while this one waited for it.)
    PyObject* current = PyObject_GetAttr(self, s_hot);
    if (current == nullptr) PyErr_Clear();
    bool mine = current == capsule;
    Py_XDECREF(current);
    ok = mine ? accept(*h, args + 1) : 0;
    if (ok == 1) {
      ok = 0;
      for (auto& s : h->sets) {
        int free = set_free(*h, s);
        if (free < 0) { ok = -1; break; }
        if (free == 1) {
          result = replay(*h, s, args + 1);
          ok = result == nullptr ? -1 : 1;
          break;
        }
      }
    }
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);  // (the release must not see a pending error)
    PyObject* unlocked = PyObject_CallNoArgs(h->release.ptr());
    if (unlocked == nullptr) {
      Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(trace);
      Py_XDECREF(result);
      Py_DECREF(capsule);
      return nullptr;
    }
    Py_DECREF(unlocked);
    PyErr_Restore(type, value, trace);
  }
  if (ok != 0) {
    Py_DECREF(capsule);
    return result;  // a replay, or an error of it (as the Python path raises it)
  }
  // Declined (another call shape, a check in doubt, a held result everywhere): the Python
  // path may change what this state mirrors, so drop it first; the call re-arms after.
  // (only this state: another thread may have armed the wrapper anew since)
  PyObject* current = PyObject_GetAttr(self, s_hot);
  int dropped = 0;
  if (current == nullptr) {
    dropped = -1;
  } else if (current == capsule) {
    PyObject* served = PyLong_FromLong(h->served);
    dropped = served == nullptr ? -1 : PyObject_SetAttr(self, s_served, served);
    Py_XDECREF(served);
    if (dropped == 0) dropped = PyObject_SetAttr(self, s_hot, Py_None);
  }
  Py_XDECREF(current);
  Py_DECREF(capsule);
  if (dropped < 0) return nullptr;
  return python_path(args, nargsf, kwnames);
}

PyMethodDef hot_def = {"__call__", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(hot_call)),
                       METH_FASTCALL | METH_KEYWORDS, "Call the wrapped function (graphmodule's compiled hot path)."};

py::object get(const py::dict& d, const char* key) { return d[key]; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", [](py::object cls, py::object python_call, py::object arm) {
    if (g_python_call == nullptr) {
      s_hot = PyUnicode_InternFromString("_hot");
      s_raised = PyUnicode_InternFromString("raised");
      s_modes = PyUnicode_InternFromString("_modes");
      s_replays = PyUnicode_InternFromString("replays");
      s_read = PyUnicode_InternFromString("read");
      s_served = PyUnicode_InternFromString("_hot_served");
      g_one = PyLong_FromLong(1);
    }
    Py_XDECREF(g_python_call);
    Py_XDECREF(g_arm);
    ++g_epoch;
    g_python_call = python_call.inc_ref().ptr();
    g_arm = arm.inc_ref().ptr();
    py::object fn = py::reinterpret_steal<py::object>(PyCFunction_New(&hot_def, nullptr));
    py::object method = py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr()));
    cls.attr("__call__") = method;
  });
  m.def("served", [](py::object capsule) {
    return static_cast<Hot*>(PyCapsule_GetPointer(capsule.ptr(), kCapsule))->served;
  });
  m.def("make", [](py::dict d, py::list sets) {
    auto* h = new Hot();
    h->epoch = g_epoch;
    h->n = d["n"].cast<size_t>();
    h->n_pos = d["n_pos"].cast<size_t>();
    h->kwnames = d["kwnames"];
    h->thread = d["thread"].cast<unsigned long>();
    h->grad = d["grad"].cast<bool>();
    h->inference = d["inference"].cast<bool>();
    for (const char* k : {"n", "n_pos", "kwnames", "thread", "grad", "inference", "direct_addresses", "acquire", "release", "stats", "depth", "active", "guard_check", "mode_flag",
                          "mode_reader", "mode", "modes", "interaction_fn", "interaction", "watch_flag",
                          "containers", "keys", "objects", "cells", "cell_objects", "same_addresses", "tobjs",
                          "tptrs", "tindex", "use_count"}) {
      if (!d.contains(k)) {
        delete h;
        throw py::key_error(k);
      }
    }
    h->acquire = get(d, "acquire"); h->release = get(d, "release"); h->stats = get(d, "stats");
    h->depth = get(d, "depth"); h->active = get(d, "active"); h->guard_check = get(d, "guard_check");
    h->mode_flag = get(d, "mode_flag"); h->mode_reader = get(d, "mode_reader"); h->mode = get(d, "mode");
    h->modes = get(d, "modes"); h->interaction_fn = get(d, "interaction_fn"); h->interaction = get(d, "interaction");
    h->watch_flag = get(d, "watch_flag"); h->containers = get(d, "containers"); h->keys = get(d, "keys");
    h->objects = get(d, "objects"); h->cells = get(d, "cells"); h->cell_objects = get(d, "cell_objects");
    h->same_addresses = get(d, "same_addresses"); h->tobjs = get(d, "tobjs"); h->tptrs = get(d, "tptrs");
    h->tindex = get(d, "tindex"); h->use_count = get(d, "use_count");
    for (auto item : sets) {
      py::dict s = item.cast<py::dict>();
      OutputSet o;
      for (auto b : s["bufs"].cast<py::list>()) o.bufs.push_back(py::reinterpret_borrow<py::object>(b));
      o.replay = s["replay"]; o.replay_arg = s["replay_arg"]; o.kind = s["kind"].cast<int>();
      o.out = s["out"]; o.cdata = s["cdata"]; o.base = s["base"];
      if (o.kind == 0) {  // count directly where that count is torch's now (and so later)
        auto* impl = static_cast<c10::StorageImpl*>(PyLong_AsVoidPtr(o.cdata.ptr()));
        py::object torch_count = h->use_count(o.cdata);
        if (impl != nullptr && torch_count.cast<size_t>() == c10::raw::intrusive_ptr::use_count(impl)) {
          o.storage = impl;
          o.direct_base = o.base.cast<size_t>();
        }
      }
      h->sets.push_back(std::move(o));
    }
    // the addresses compared here where that agrees with torch's comparison now
    if (d["direct_addresses"].cast<bool>()) {  // (lists, every index compared: see _native.py)
      py::list tobjs = h->tobjs.cast<py::list>();
      py::list tptrs = h->tptrs.cast<py::list>();
      for (size_t i = 0; i < tobjs.size() && i < tptrs.size(); ++i) {
        h->addressed.push_back(py::reinterpret_borrow<py::object>(tobjs[i]));
        h->addresses.push_back(PyLong_AsVoidPtr(tptrs[i].ptr()));
      }
      h->direct_addresses = tobjs.size() == tptrs.size() && addresses_ok(*h) == 1;
    }
    return py::reinterpret_steal<py::object>(PyCapsule_New(h, kCapsule, destroy));
  });
}
