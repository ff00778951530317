"""compile/forked.py: a forked child takes chunks of the Services of a one-shot compile.
The fragments must be exactly a one-process compile's, in the same order; whatever goes
wrong in the child (it fails, it never gets a core) must look like no child at all (the
same result, the same error), and no child may be left behind."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from reconciler.compile import forked
from reconciler.compile.ruleset import NftSyntaxError
from reconciler.compile.services import FAMILIES, family_context, slices_by_service

from benchmix import bench_mix


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    inventory, cfg = bench_mix(tmp_path_factory.mktemp("forked"), 300, 3)
    services = sorted(inventory.services, key=lambda s: (s.namespace, s.name))
    assert len(services) >= forked.MIN_SERVICES
    contexts = {f: family_context(cfg, f) for f in FAMILIES}
    return services, slices_by_service(inventory.endpoint_slices), cfg, contexts


@pytest.fixture
def spy(monkeypatch):
    """How many children compile_services forked."""
    started = []
    real = forked.start

    def start(works):
        pids = real(works)
        started.append(len(pids))
        return pids

    monkeypatch.setattr(forked, "start", start)
    monkeypatch.setattr(forked, "cores", lambda: 2)
    return started


def _no_children_left():
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_same_fragments_in_the_same_order(world, spy):
    one = forked.compile_services(*world, fork=False)
    two = forked.compile_services(*world)
    assert spy == [1]
    assert two == one
    assert [f.service_key for f in two] == [f.service_key for f in one]
    _no_children_left()


def test_few_services_compile_in_one_process(world, spy):
    services, *rest = world
    assert forked.compile_services(services[:forked.MIN_SERVICES - 1], *rest) == \
        forked.compile_services(services[:forked.MIN_SERVICES - 1], *rest, fork=False)
    assert spy == []


def test_a_child_that_fails_is_replaced_by_this_process(world, spy, monkeypatch):
    def boom(*a, **k):
        raise MemoryError("in the child")

    monkeypatch.setattr(forked.pickle, "dumps", boom)  # only the child pickles
    assert forked.compile_services(*world) == forked.compile_services(*world, fork=False)
    assert spy == [1]
    _no_children_left()


def test_a_child_without_a_core_is_not_waited_for(world, spy, monkeypatch):
    def starved(pull, fd, compile_chunk):  # takes a chunk, then never gets to it
        pull.take()
        time.sleep(60)

    monkeypatch.setattr(forked, "_child", starved)
    t = time.monotonic()
    assert forked.compile_services(*world) == forked.compile_services(*world, fork=False)
    assert time.monotonic() - t < 30
    assert spy == [1]
    _no_children_left()


@pytest.mark.parametrize("where", [[0], [-1], [-1, 0], [20, 290]])
def test_a_compile_error_is_the_one_process_error(world, spy, where):
    """Bad Services in this process' chunks, the child's, or both: the first in order
    is the error, as in one process."""
    services, *rest = world
    services = list(services)
    for i in where:
        services[i] = dataclasses.replace(services[i], name=f"x{i}; add table ip pwn")
    with pytest.raises(NftSyntaxError) as want:
        forked.compile_services(services, *rest, fork=False)
    with pytest.raises(NftSyntaxError) as got:
        forked.compile_services(services, *rest)
    assert str(got.value) == str(want.value)
    assert spy == [1]
    _no_children_left()
