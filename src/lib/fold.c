/* SPDX-License-Identifier: MIT */ /* stub: being written */
